"""The real LeRobot library against recap (``make test-lerobot``: ``.venv-lerobot``, Python 3.12,
``lerobot[pi,dataset]==0.6.1`` beside recap). Where ``lerobot`` is not importable (``.venv``,
``make test``, CI) nothing here is collected. Offline by construction: the Hub is never asked.
"""

import importlib.util
import os

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
    os.environ.setdefault(_name, "1")

if importlib.util.find_spec("lerobot") is None:
    collect_ignore_glob = ["test_*.py", "lerobot_*.py"]
