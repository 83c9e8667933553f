"""A host's notification service, as far as the scheduler's simulation sees it: a dispatcher
that records one delivery row per event in the host's own table (``host_deliveries``)."""
