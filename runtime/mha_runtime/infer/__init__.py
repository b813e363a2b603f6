"""What runs artifacts of every kind: execution providers, the CPU fingerprint, the offline-optimized copy picked."""
