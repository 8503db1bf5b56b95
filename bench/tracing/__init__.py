"""What a traced request costs: stage spans on and off."""
