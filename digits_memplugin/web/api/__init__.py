"""The JSON API under <prefix>/api."""
