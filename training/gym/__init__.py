"""GRPO on gymnasium environments: config (`config`), reward functions (`rewards`), the MLP policy
and its zip file (`policy`), and the trainer (`trainer`, needs torch)."""
