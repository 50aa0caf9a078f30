"""`python -m bench` (what `make bench` runs); the code lives in bench.run so spawned clients can import it."""

from bench.run import app

if __name__ == "__main__":
    app()
