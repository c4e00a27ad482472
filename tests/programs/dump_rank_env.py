"""A stand-in training script: writes its argv and environment to $DUMP_DIR/rank<RANK>.json."""

import json
import os
import sys

with open(os.path.join(os.environ["DUMP_DIR"], f"rank{os.environ['RANK']}.json"), "w") as fh:
    json.dump({"argv": sys.argv[1:], "env": dict(os.environ)}, fh)
