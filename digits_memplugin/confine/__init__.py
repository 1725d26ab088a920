"""Confinement the kernel enforces (Landlock) for the children that read untrusted input."""
