"""Running jobs: submission, placing on devices, the attempt loop and each attempt's child process,
the watchdog."""
