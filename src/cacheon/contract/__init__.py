"""The narrow waist: slot specs, trusted references, comparators and the catalog."""
