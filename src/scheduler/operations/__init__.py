"""Running the service: heartbeats, metrics, retention and the console's overview figures."""
