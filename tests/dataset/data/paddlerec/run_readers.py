# Writes what a PaddleRec RecDataset reader yields as dense features (see README.md).
# Runs PaddleRec's own readers (Paddle 2.6.2) on the sample and prints their dense output as
# float32 bit-exact text (%.9g round-trips float32).
import sys, importlib.util, numpy as np
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
which, reader_py, data = sys.argv[1:4]
m = load(reader_py, "reader_" + which)
ds = m.RecDataset([data], {})
for out in ds:
    dense = np.asarray(out[-1], dtype=np.float32)
    print(" ".join("%.9g" % v for v in dense))
