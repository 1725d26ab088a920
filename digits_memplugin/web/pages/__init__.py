"""The HTML pages and the New model form."""
