"""The service's side of training: the job runner and model store behind ``/train``,
``/models`` and ``/inference`` (`service`), and the SFT and GRPO job types of small LMs
(`llm_jobs`). The trainers themselves live in the top-level `training` package."""
