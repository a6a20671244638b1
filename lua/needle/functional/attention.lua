-- (filled by its family's commit)
return {}
