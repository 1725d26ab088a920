"""Hosting the plugin: the Flask extension, the standalone app and server, the settings, the HTTP framing
checks, and which Caffe trains."""
