"""Reading and writing other RECAP implementations' artifacts (``rlinf``: RLinf's files)."""
