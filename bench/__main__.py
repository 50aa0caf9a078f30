"""`python -m bench`, what `make bench` runs. The code lives in bench.run and the modules it imports:
spawned clients import them."""

from bench.run import app

if __name__ == "__main__":
    app()
