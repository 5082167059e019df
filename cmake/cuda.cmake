# CUDA kernels (RINGREDUCE_WITH_CUDA = AUTO | ON | OFF). Not built yet.
set(RR_WITH_CUDA_VALUE 0)
