"""The folder `instrument run` puts first on PYTHONPATH; its sitecustomize.py
turns the SDK on in every Python process the program starts."""
