"""Output: the controller's remote output and progress bars (`logs`, `progress`, layer 1), the
per-rank log files agents keep (`logfiles`), and a proc's side of output attribution
(`capture`, layer 3)."""
