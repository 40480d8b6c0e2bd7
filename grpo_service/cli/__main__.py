from grpo_service.cli import main

main()
