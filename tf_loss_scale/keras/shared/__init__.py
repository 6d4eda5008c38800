"""What the Keras front ends share: families, protocols, members, slots."""
