"""The HTTP edge: the composition root, the API routes, the console, the inbox and the OpenAPI document."""
