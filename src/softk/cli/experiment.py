"""`softk experiment` (placeholder until its issue lands)."""


def register(sub):
    p = sub.add_parser("experiment", help="(not implemented yet)")
    p.set_defaults(run=lambda args: print("softk experiment: not implemented yet") or 0)
