"""One trial on one machine: train (`train`), evaluate at depth and record the rows (`execute`), store and read the
weights again (`weights`), what a Tune trial is asked to do (`work`: a training and/or readings of trained weights),
the checks it makes first (`preflight`) and how its process's malloc keeps freed memory (`heap`). `work` is
torch-free: the driver plans with it."""
