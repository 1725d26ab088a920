"""The estimate as a service: the worker pool, the datasets it reads (in confined reader processes), the
files it may open, and pycaffe asked for shapes in a sandboxed child."""
