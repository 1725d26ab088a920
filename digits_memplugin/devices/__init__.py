"""The devices training can run on: GPUs through NVML, the CPU, a cluster's hosts, and the fake NVML library
of the tests and the demo."""
