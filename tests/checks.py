"""The pass/fail tally the Python tests (flight_adbc.py, object_stores.py) print and exit by."""


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"ok   {name}")
        else:
            self.failed += 1
            print(f"FAIL {name} {detail}")
