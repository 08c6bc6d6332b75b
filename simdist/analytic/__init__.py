"""Closed forms, no simpy: parameters, FLOPs, memory and communication volume."""
