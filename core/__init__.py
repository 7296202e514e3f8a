"""What every package of the bot shares and nothing of it imports: the root of the error tree (errors.py) and the
one redactor of secrets (secrets.py)."""
