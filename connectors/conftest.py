"""The connectors' tests share ``engine_testing`` (tiny local models and their reference)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
