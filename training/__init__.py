"""Training: GRPO's math (`training.grpo`), the gymnasium trainer (`training.gym`) and the job
runner that runs trainers in their own processes (`training.jobs`).

Never imports `grpo_service`. Importing this package does not import torch: the API process
validates job configs and serves saved policies with numpy; torch loads in the training process.
"""
