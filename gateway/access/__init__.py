"""Who is calling: API keys, their stores and cache, the admin credential, the key CLI."""
