/* An empty library whose soname is one of the CUDA libraries cudarc opens by name
   (libnvrtc.so, libcublas.so); it needs the interpreter (soname libcuda.so), so the
   symbols cudarc looks up through it are the interpreter's. */
