"""`python -m bench`, what `make bench` runs. The code lives in bench.run: spawned clients import it."""

from bench.run import app

if __name__ == "__main__":
    app()
