"""`UserError`: bad input. The lowest module: every layer raises it, the CLI turns it into one line."""


class UserError(Exception):
    """Bad input: the message is one line saying what is wrong and how to fix it (exit code 2)."""
