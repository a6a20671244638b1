#!/usr/bin/env python3
"""wrap_pickle.py PICKLE OUT.pt [--root NAME]

Wraps a raw pickle (e.g. a libFuzzer artifact of fuzz_pickle) into the
smallest torch.save-style zip: <root>/data.pkl, <root>/version, stored
entries. The result goes to spec/fixtures/fuzz/ so that
spec/load_torch_spec.lua (its fuzz findings) can load it through nd.load_torch. Standard
library only (no PyTorch)."""
import sys
import zipfile

def main():
    args = sys.argv[1:]
    root = "archive"
    if "--root" in args:
        i = args.index("--root")
        root = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    src, dst = args
    data = open(src, "rb").read()
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as z:
        for name, payload in ((root + "/data.pkl", data), (root + "/version", b"3\n")):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            z.writestr(info, payload)

if __name__ == "__main__":
    main()
