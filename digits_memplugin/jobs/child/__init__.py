"""The training child: the pycaffe runner and the `caffe` binary runner, what it is told about its attempt,
its confinement and BLAS warm-up. Imports only core and confine."""
