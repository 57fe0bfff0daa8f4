"""bench: latency, throughput, memory, accuracy (and Jetson power) of artifacts side by side."""
