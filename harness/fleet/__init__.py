"""Ray fleet: one plan over many machines; each device runs its own cells, accuracy is sharded, results gathered."""
