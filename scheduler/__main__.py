from scheduler.cli import scheduler

scheduler(prog_name="python -m scheduler")
