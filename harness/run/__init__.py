"""Running a sweep: the scheduler (cells, status, resume, isolation, interrupts) and the executor of passes."""
