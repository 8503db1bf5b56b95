"""HTTP server candidates for the gateway, compared on throughput and on hostile clients."""
