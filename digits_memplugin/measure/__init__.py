"""Ground truth: what pycaffe really allocates to train a net, measured in a child process.

In CPU mode Caffe's buffers are malloc'd, so glibc's mallinfo2() (uordblks + hblkhd) read before and after solver
construction + one training iteration + one test pass gives the bytes Caffe allocated. The estimator's CPU engine
is held to this measurement (tests/test_accuracy.py, bench/accuracy.py).
"""
