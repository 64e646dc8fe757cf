"""Knowledge distillation: a teacher's forward pass and the transfer of its outputs in a
student's training step."""
