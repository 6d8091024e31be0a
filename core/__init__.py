"""The ground floor: helpers every app may use. It imports no app of this project."""
