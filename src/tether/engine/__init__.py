"""The application: commands (one transaction each) and the runtime that carries out their
side effects from the outbox."""
