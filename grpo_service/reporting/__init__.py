"""What people look at: the trace viewer (`viewer/`) and evaluation reports (`eval_report`)."""
