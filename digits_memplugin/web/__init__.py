"""The web layer: a blueprint of thin views and JSON endpoints, and the socketio namespace."""
