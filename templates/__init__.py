"""Jinja templates of digits-memplugin, shipped inside the package as digits_memplugin.templates."""
