"""Datasets: finding the files, reading them into arrays, coding text columns, checking them against a model."""
