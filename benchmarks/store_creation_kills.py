"""How many homes a kill during the first MLflow store creation leaves broken (issue 40.3).

Each try makes a new home's store in a forked child (tests/programs/store_creator.py:
the supervisor's own calls, imports paid once) and kills it with SIGKILL at a
random instant over the creation (uniform on 0..1.1x the time an unkilled creation
took). The home is then judged by MLflow's own checks: no store (a fresh home),
whole, or broken; a broken one is also opened by MLflow as it is (a copy) to see
whether MLflow gets past it by itself ("stuck": it does not, for good).

``--mode mlflow`` makes the stores as MLflow does alone (in place, no lock: dstui
before issue 40); ``--mode dstui`` as dstui does now (a temporary file renamed
into place under a lock).

    python benchmarks/store_creation_kills.py --mode dstui --tries 30
    python benchmarks/store_creation_kills.py --mode mlflow --tries 30
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "programs"))

from store_creator import Creator, store_state  # noqa: E402


def stuck(path: Path) -> bool:
    """Whether MLflow, opening this store as it is (a copy), fails: what every later batch of the home met."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.db"
        shutil.copy(path, copy)
        try:
            SqlAlchemyStore(f"sqlite:///{copy}", "file:///unused")
        except Exception as e:  # noqa: BLE001 - any failure to open is the finding
            print(f"    MLflow cannot open it: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            return True
        finally:
            SqlAlchemyStore._engine_map.pop(f"sqlite:///{copy}", None)
    return False


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("dstui", "mlflow"), default="dstui")
    p.add_argument("--tries", type=int, default=30)
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    creator = Creator(args.mode)
    with tempfile.TemporaryDirectory(prefix="store-kills-") as tmp:
        root = Path(tmp)
        code, whole_s = creator.make(f"sqlite:///{root / 'calibration' / 'mlflow.db'}")
        assert code == 0, "an unkilled creation failed"
        print(f"mode {args.mode}: an unkilled creation took {whole_s:.2f} s; {args.tries} tries, seed {seed}")
        states: Counter[str] = Counter()
        killed = stuck_n = 0
        for i in range(args.tries):
            store = root / f"home-{i}" / "mlruns" / "mlflow.db"
            after = rng.uniform(0, whole_s * 1.1)
            code, _ = creator.make(f"sqlite:///{store}", kill_after=after)
            killed += code == -9
            state = store_state(str(store))
            states[state] += 1
            print(f"  try {i:2d}: kill at {after:5.2f} s -> {'killed' if code == -9 else 'had ended'}, store {state}")
            if state == "broken":
                stuck_n += stuck(store)
    creator.close()
    print(f"{args.mode}: {args.tries} tries, {killed} cut short; stores: {states['none']} none (a fresh home), "
          f"{states['whole']} whole, {states['broken']} broken ({stuck_n} that MLflow cannot open any more)")  # fmt: skip
    return 0 if args.mode == "mlflow" or states["broken"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
