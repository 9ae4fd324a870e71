"""The GPU checks import the vLLM connector's worker code from the source tree: it needs torch
but not vLLM, and the check machine has no vLLM."""

import os
import sys

_VLLM_CONNECTOR = os.path.join(os.path.dirname(__file__), "..", "..", "connectors", "vllm")
if os.path.abspath(_VLLM_CONNECTOR) not in map(os.path.abspath, sys.path):
    sys.path.insert(0, os.path.abspath(_VLLM_CONNECTOR))
