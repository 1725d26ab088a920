"""The socketio namespace, its JSON and its rate limits."""
