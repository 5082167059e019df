"""Arrays as the engine sees them: any array (numpy, anything with the buffer protocol or
DLPack, torch tensors, cupy arrays, ``__cuda_array_interface__``) described as a `Buffer`
(`buffer`), the operations ringreduce needs on each library's arrays (`kinds`), a
collective's input and output (`inout`), and memory on a CUDA device (`cuda`)."""
