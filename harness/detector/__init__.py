"""The detector contract: what families give and backends run (protocol, CoreSource, specs, stats, weights, engine
files) and the graph tools both use."""
