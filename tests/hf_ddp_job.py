"""A two-process Hugging Face Trainer job on CPU (gloo) with HfProfilerCallback and
Transformers' MLflowCallback; run by tests/integrations/test_transformers.py under torchrun.

Usage: torchrun --nproc-per-node 2 tests/hf_ddp_job.py OUTPUT_DIR LOCAL_DIR
(MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME from the environment, as MLflowCallback reads.)
"""

from __future__ import annotations

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import neuron_mlflow as nm


def main(output_dir: str, local_dir: str) -> None:
    callback = nm.HfProfilerCallback(
        schedule=nm.Schedule(warmup=1, active=2), backend="cpu", local_dir=local_dir
    )
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16, vocab_size=64,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (32, 16))]
    args = TrainingArguments(output_dir=output_dir, max_steps=4, use_cpu=True,
                             ddp_backend="gloo", per_device_train_batch_size=2,
                             logging_steps=1, save_strategy="no", report_to=["mlflow"],
                             disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                      callbacks=[callback])  # fmt: skip
    trainer.train()
    callback.wait()  # each rank's windows in MLflow before the test reads the run
    print(f"RANK={args.process_index} WORLD={args.world_size} RUN_ID={callback.run_id}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
