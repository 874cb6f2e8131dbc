"""Train a model on the DeepSpeed engine (ZeRO-3; Ascend NPU, CUDA or CPU). Restart = resume.

    python scripts/train.py --gin_file demo/toy.gin [--gin_param 'train.max_steps = 10']
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --master_port 29511 scripts/train.py \
        --gin_file demo/toy.gin
"""

from recap.cli import run_step
from recap.steps.train import train

if __name__ == "__main__":
    run_step(train)
